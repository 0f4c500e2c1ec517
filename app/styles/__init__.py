"""The app's Textual stylesheets (.tcss), shipped as package data."""
