"""Properties are ordinary pytest + Hypothesis tests; the etprop plugin
(etprop.commands.pytest_plugin, loaded through its entry point) supplies ``flow``,
``flow_pair`` and the ``etprop`` session."""
