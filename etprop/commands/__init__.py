"""What a user runs: the ``etprop`` CLI (``cli``) and its commands (``campaign``,
``gate``, ``replay``, ``shrink``), the reports (``report``), the example
database (``database``) and the pytest plugin that properties run under
(``pytest_plugin``).

Imports: anything below (program, lowering, flows, oracles, verdicts); the
property modules are found as package data, never imported.
"""
