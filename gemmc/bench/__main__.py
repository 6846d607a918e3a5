import sys

from .cli import main

if __name__ == "__main__":  # spawned compile workers import this module too
    sys.exit(main())
