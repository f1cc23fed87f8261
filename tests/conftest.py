import pytest


@pytest.fixture(scope="session")
def pair():
    """The embedded pair, loaded once (prepared on first use: ~1 min)."""
    from sdeth.models import load_pair
    return load_pair("embedded")
