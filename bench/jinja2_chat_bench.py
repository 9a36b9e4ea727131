#!/usr/bin/env python3
"""Times Jinja2 rendering a model folder's chat template over a conversation, as transformers
sets Jinja2 up (tests/chat_template/jinja_reference.py), for comparison with
`carpool-bench-tokenizer --chat-messages` (docs/PERFORMANCE.md): the template compiled once,
then `template.render(**context)`; best time per call of 5 passes of 200 calls.

  /usr/bin/python3 bench/jinja2_chat_bench.py MODEL_DIR MESSAGES.json
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "chat_template"))
import jinja_reference  # noqa: E402


def main():
    model_dir, messages_file = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(messages_file, encoding="utf-8") as f:
        messages = json.load(f)
    template = jinja_reference.make_environment().from_string(
        jinja_reference.select_template(config))
    context = jinja_reference.chat_context(config, messages)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            template.render(**context)
        best = min(best, (time.perf_counter() - start) / 200)
    print(f"jinja2 {best * 1e6:.1f} us per render ({len(template.render(**context))} bytes)")


if __name__ == "__main__":
    main()
