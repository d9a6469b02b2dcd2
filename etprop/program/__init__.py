"""The program model: the spec format (``spec``), the op vocabulary it draws
from (``vocabulary``), and the one builder that turns a spec into an
``nn.Module`` with inputs and into the source of a standalone repro (``builder``).

Imports: torch and ``etprop.errors`` only; nothing else of etprop.
"""
