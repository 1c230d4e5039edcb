"""Training loops: supervised warm start (sft), RL (rl) and the CPU demo pipeline (demo)."""
