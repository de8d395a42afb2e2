"""Run the lab's simulated engine: `python3 -m engine_standin <vLLM api_server arguments>`."""

import sys

from .engine import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
