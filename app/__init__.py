"""TTTR: the command line and the Textual app. Only this package may import textual."""
