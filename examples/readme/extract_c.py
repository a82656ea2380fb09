#!/usr/bin/env python3
"""Writes the first ```c block of README.md to a .c file, so the README's example is compiled
and run as a test and cannot drift from the API."""
import sys


def main(readme, output):
    lines = open(readme, encoding="utf-8").read().splitlines()
    try:
        start = lines.index("```c") + 1
        end = lines.index("```", start)
    except ValueError:
        sys.exit(f"{readme}: no ```c ... ``` block found")
    with open(output, "w", encoding="utf-8") as f:
        f.write(f"/* Generated from {readme.split('/')[-1]} by extract_c.py; edit the README. */\n")
        f.write("\n".join(lines[start:end]) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: extract_c.py README.md out.c")
    main(sys.argv[1], sys.argv[2])
