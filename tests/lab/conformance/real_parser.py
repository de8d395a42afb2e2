"""Parse command lines with the real vLLM 0.10.1.1's OpenAI server parser; run in the real
engine's root (tests/lab/real_engine), as its api_server would.

    in-engine-root python3 real_parser.py < [["--max-model-len", "256000"], ...]

Prints, per command line, whether the server would start with it: argparse's verdict (exit
status 2 and its message), then what the parser and the server check after it (the config
file, validate_parsed_serve_args, validate_api_server_args: exit status 1 and the exception).
"""

import contextlib
import io
import json
import sys

from vllm.entrypoints.openai.api_server import validate_api_server_args
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils import FlexibleArgumentParser


def verdict(parser, argv):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
        validate_api_server_args(args)
    except SystemExit as exit_:
        return {"status": exit_.code, "error": errors.getvalue().strip().splitlines()[-1:]}
    except Exception as error:  # the server ends with its traceback: status 1
        return {"status": 1, "error": [f"{type(error).__name__}: {error}"]}
    return {"status": 0, "error": []}


def main():
    cases = json.load(sys.stdin)
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    json.dump([verdict(parser, argv) for argv in cases], sys.stdout)


if __name__ == "__main__":
    main()
