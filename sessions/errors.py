"""The store's error for mistakes a user can make: a bad path, a foreign or damaged file,
an unknown run. One line: what is wrong, with the offending value, and what to do."""


class StoreError(Exception):
    exit_code = 2
