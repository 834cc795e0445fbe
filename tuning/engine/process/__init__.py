"""Child processes: persistent worker pools, one-shot isolated calls, the sandbox they run in, and the lifeline tying them to their starter."""
