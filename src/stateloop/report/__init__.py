"""Tables (pandas -> CSV + Markdown) and figures (matplotlib -> PDF + PNG) from the run folders."""
