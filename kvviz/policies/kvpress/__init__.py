"""kvpress' presses in kvviz: presses by name and the kvviz policy and settings that reproduce each
(``presses``), and a press's own score code run on a policy's candidates (``score_code``)."""
