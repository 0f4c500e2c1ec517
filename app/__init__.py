"""The interfaces: the `tttr` command line (`cli`, `commands/`), the Textual app (`tui`,
`screens/`, `widgets/`, and the plain-data views they paint: `runview`, `compare`,
`describe`, `forking`, `search`), and the HTTP server for the OpenAI API (`server`).
Only this package imports textual or starlette."""
