"""Units named once."""

JOULES_PER_KWH = 3.6e6


def joules_to_kwh(joules: float) -> float:
    return joules / JOULES_PER_KWH
