"""Command-line tools, one ``heisd-<verb>`` entry point each."""
