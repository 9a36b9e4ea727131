#!/usr/bin/env python3
"""Writes a deterministic chat conversation (a JSON array of OpenAI messages) for the chat
template benchmark (carpool-bench-tokenizer --chat-messages FILE; docs/PERFORMANCE.md):
a system prompt, then user and assistant turns in alternation, their text taken from this
repository's docs/*.md paragraphs in a fixed order.

  make_chat_conversation.py OUT.json [--messages 20] [--user-paragraphs 1] [--assistant-paragraphs 3]

--short makes every message one sentence, the case where rendering weighs most against
tokenizing.
"""
import argparse
import glob
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def paragraphs():
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        with open(path, encoding="utf-8") as f:
            for block in f.read().split("\n\n"):
                block = block.strip()
                if len(block) >= 200 and not block.startswith(("|", "#", "    ", "```")):
                    out.append(block)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--user-paragraphs", type=int, default=1)
    ap.add_argument("--assistant-paragraphs", type=int, default=3)
    ap.add_argument("--short", action="store_true")
    args = ap.parse_args()
    rng = random.Random(14)
    pool = paragraphs()
    rng.shuffle(pool)
    it = iter(pool * 10)

    def text(n):
        if args.short:
            return next(it).split(". ")[0] + "."
        return "\n\n".join(next(it) for _ in range(n))

    messages = [{"role": "system", "content": "You are a helpful assistant who answers "
                 "questions about the carpool serving cluster precisely and briefly."}]
    while len(messages) < args.messages:
        if messages[-1]["role"] in ("system", "assistant"):
            messages.append({"role": "user", "content": text(args.user_paragraphs)})
        else:
            messages.append({"role": "assistant", "content": text(args.assistant_paragraphs)})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(messages, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
