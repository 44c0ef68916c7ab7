"""kvpress' presses in kvviz: presses by name and the kvviz policy and settings that reproduce each (``presses``), and
any press object run through its own code (``own_code``)."""
