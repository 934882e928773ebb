#!/usr/bin/env python3
"""grammar_validate.py - validate JSON outputs of constrained generation against their schemas
with Python's jsonschema, the independent judge tests/test_grammar.c asks after its own.

    python3 tests/grammar_validate.py CASES.json

CASES.json is {"cases": [{"schema": {...}, "output": "text"}]}. Each output must parse as JSON
and validate under the Draft 2020-12 validator (formats checked where jsonschema can: date,
uuid). Prints one line per failure and exits 1 on any, else 0; exit status 77, with a line
saying so, when jsonschema is not installed (Debian package python3-jsonschema).
"""

import json
import sys

SKIP = 77

try:
    import jsonschema
except ImportError:
    print("grammar_validate.py: SKIPPED: python3-jsonschema is not installed")
    sys.exit(SKIP)


def main(path):
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    failures = 0
    for i, case in enumerate(cases):
        try:
            value = json.loads(case["output"])
            jsonschema.Draft202012Validator(case["schema"], format_checker=checker).validate(value)
        except (ValueError, jsonschema.ValidationError) as err:
            failures += 1
            print("case %d: %s: %s" % (i, str(err).splitlines()[0], case["output"][:300]))
    print("grammar_validate.py: %d of %d outputs valid" % (len(cases) - failures, len(cases)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
