"""Reports: the cells of an experiment as tables, JSON, markdown and HTML with plots."""
