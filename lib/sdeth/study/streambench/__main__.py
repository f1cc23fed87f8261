"""`python -m sdeth.study.streambench`: the same as `python -m sdeth bench streams`."""
from . import main

if __name__ == "__main__":
    main()
