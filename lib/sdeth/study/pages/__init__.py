"""The rendered reports: notebooks run headless (`python -m sdeth.study.pages.report`), the index, the notebooks'
tables and plots."""
