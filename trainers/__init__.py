"""Reference DP / TP / PP / ZeRO trainers of the nanoccl study (see trainers/README.md)."""
