"""Recorded defects as package data: ``index.json`` (signatures), one write-up
per finding and ``repros/`` (specs and scripts). Read through
``etprop.verdicts.known_findings``; no code lives here."""
