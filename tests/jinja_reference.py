#!/usr/bin/env python3
"""jinja_reference.py - render the committed chat templates with Python's jinja2 as transformers'
apply_chat_template does; the reference that tests/test_jinja.c compares the C engine with.

    python3 tests/jinja_reference.py --out DIR
        renders every tests/data/chat_templates/*.jinja with every conversation of
        tests/data/chat_templates/conversations.json (add_generation_prompt true and false)
        and writes DIR/expected.json: {"now": epoch, "cases": [{"template", "conversation",
        "add_generation_prompt", "context", then "output" or "error" and "raised"}]}
    python3 tests/jinja_reference.py --render TEMPLATE [CONTEXT.json]
        prints one rendering (for debugging), or "RAISED: msg" / "ERROR: msg"

The environment is transformers' (utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and the {% generation %} tag, tojson = json.dumps(x, ensure_ascii=False, indent=None,
separators=None, sort_keys=False), raise_exception(message) and strftime_now(format). Here
strftime_now formats the fixed time `now` of conversations.json as UTC so that outputs are
reproducible; test_jinja gives jinja_render_opts the same time. The context of a render is what
apply_chat_template passes: messages, tools (None when the conversation has none),
documents=None, add_generation_prompt, the template family's special tokens and keyword
arguments (firefunction's `functions`), then the conversation's (enable_thinking, ...).

Exit status 77, with a line saying so, when jinja2 is not installed (Debian package
python3-jinja2): test_jinja then skips the comparison. Standard library + jinja2 only.
"""

import argparse
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")
SKIP = 77

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja_reference.py: SKIP: Python's jinja2 is not installed "
          "(Debian package python3-jinja2; ./configure.py --install-deps installs it)")
    sys.exit(SKIP)


class RaisedError(TemplateError):
    """What raise_exception() raises (transformers raises TemplateError itself)."""


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: transformers' AssistantTracker renders the body
    through a call block (it only records where the assistant's text is)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(
            lineno)

    def _generation_support(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise RaisedError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def read_template(path):
    # transformers reads chat_template.jinja in text mode; jinja2 normalizes newlines anyway
    with open(path, encoding="utf-8") as f:
        return f.read()


_compiled = {}


def render(env, source, context):
    """(output, None, False) or (None, message, raised). Templates compile once."""
    try:
        key = (id(env), source)
        if key not in _compiled:
            _compiled[key] = env.from_string(source)
        return _compiled[key].render(**context), None, False
    except RaisedError as e:
        return None, str(e.message), True
    except Exception as e:  # noqa: BLE001 - any error counts; the C engine must fail too
        return None, "%s: %s" % (type(e).__name__, e), False


def contexts(spec):
    """(template, conversation id, add_generation_prompt, context) for every pair."""
    for name in sorted(spec["templates"]):
        tokens = spec["templates"][name]
        for conv in spec["conversations"]:
            for agp in conv.get("add_generation_prompt", [True, False]):
                context = {
                    "messages": conv["messages"],
                    "tools": conv.get("tools"),
                    "documents": None,
                    "add_generation_prompt": agp,
                }
                context.update({k: v for k, v in tokens.items()
                                if v is not None and k != "kwargs"})
                context.update(tokens.get("kwargs", {}))
                context.update(conv.get("kwargs", {}))
                yield name, conv["id"], agp, context


def write_expected(out_dir):
    with open(os.path.join(DATA, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    env = make_env(spec["now"])
    sources = {}
    cases = []
    for name, conv_id, agp, context in contexts(spec):
        if name not in sources:
            sources[name] = read_template(os.path.join(DATA, name + ".jinja"))
        output, error, raised = render(env, sources[name], context)
        case = {"template": name, "conversation": conv_id, "add_generation_prompt": agp,
                "context": context}
        if error is None:
            case["output"] = output
        else:
            case["error"] = error
            case["raised"] = raised
        cases.append(case)
    missing = sorted(set(f[:-6] for f in os.listdir(DATA) if f.endswith(".jinja"))
                     - set(spec["templates"]))
    if missing:
        sys.exit("jinja_reference.py: templates missing from conversations.json: "
                 + ", ".join(missing))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2": jinja2.__version__, "now": spec["now"], "cases": cases}, f,
                  ensure_ascii=False, indent=1)
    errors = sum(1 for c in cases if "error" in c)
    print("jinja_reference.py: jinja2 %s rendered %d template x conversation pairs (%d raise "
          "or fail) into %s" % (jinja2.__version__, len(cases), errors,
                                os.path.join(out_dir, "expected.json")))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", metavar="DIR", help="write DIR/expected.json")
    parser.add_argument("--render", nargs="+", metavar="FILE",
                        help="TEMPLATE [CONTEXT.json]: print one rendering")
    parser.add_argument("--now", type=int, default=1722004205,
                        help="strftime_now's time for --render (seconds since the epoch, UTC)")
    args = parser.parse_args(argv)
    if args.render:
        context = {}
        if len(args.render) > 1:
            with open(args.render[1], encoding="utf-8") as f:
                context = json.load(f)
        output, error, raised = render(make_env(args.now), read_template(args.render[0]),
                                       context)
        if error is not None:
            print("%s: %s" % ("RAISED" if raised else "ERROR", error))
            return 1
        sys.stdout.write(output)
        return 0
    if not args.out:
        parser.error("give --out DIR or --render TEMPLATE [CONTEXT]")
    write_expected(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
