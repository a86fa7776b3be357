"""The settings (``settings``), their value parsers (``values``) and the log names (``logs``):
what every layer above the core reads."""
