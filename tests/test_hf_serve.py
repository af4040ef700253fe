"""`transformers serve --continuous-batching` with frostc's attention (frost_runtime.hf.serve) on the
CPU: transformers' own server, its OpenAI chat endpoint, a tiny Llama saved with a word-level
tokenizer, every attention call through frostc's continuous-batching attention (the fp32 reference
here; the plans on the GPU), and the same tokens as transformers' continuous batching with sdpa.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
for _module in ("fastapi", "uvicorn", "openai", "accelerate"):
    pytest.importorskip(_module, reason="transformers' serving extra: pip install 'transformers[serving]==5.23.*'")

from frost_runtime.hf import continuous, serve  # noqa: E402

from tests.cb_models import cb_model, peer_tokens  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 10, 11]
NEW_TOKENS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _saved_model(folder) -> object:
    """The tiny Llama (fp32, random weights) and a tokenizer whose word "tN" is token N."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = cb_model("llama")
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(model.config.vocab_size)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t2")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    return model


def _post(port: int, body: dict) -> dict:
    request = urllib.request.Request(
        f"http://localhost:{port}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return json.loads(response.read())


@pytest.mark.parametrize("fuse", [False, True], ids=["hf-layers", "fused-layers"])
def test_transformers_serve_answers_through_frostcs_attention(tmp_path, monkeypatch, fuse: bool) -> None:
    """`--fuse`: the server fuses the model it loads (hf_fuse; glue in torch without plans): the
    same tokens."""
    from frost_runtime import hf_fuse
    from transformers.cli.serve import Serve

    fused = []
    real_fuse = hf_fuse.fuse_layers
    monkeypatch.setattr(hf_fuse, "fuse_layers", lambda m, plans=None: fused.append(real_fuse(m, plans)))
    serve.fuse_on_load(fuse)
    model = _saved_model(tmp_path)
    expected = next(iter(peer_tokens(model, "llama", [PROMPT], NEW_TOKENS).values()))
    cb = continuous.install(None)  # what `python -m frost_runtime.hf.serve` registers (no plans: the reference)
    port = _free_port()
    _, args = serve.serve_arguments([str(tmp_path)])
    assert args[-3:] == ["--continuous-batching", "--attn-implementation", continuous.NAME]
    server = Serve(force_model=str(tmp_path), continuous_batching=True, attn_implementation=continuous.NAME,
                   device="cpu", dtype="float32", port=port, non_blocking=True, cb_block_size=16,
                   cb_num_blocks=64)  # fmt: skip
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://localhost:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        content = " ".join(f"t{t}" for t in PROMPT)
        body = {"model": str(tmp_path), "messages": [{"role": "user", "content": content}],
                "max_tokens": NEW_TOKENS, "temperature": 0}  # fmt: skip
        answer = _post(port, body)
    finally:
        server.kill_server()
        serve.fuse_on_load(False)
    assert fused == ([model.config.num_hidden_layers] if fuse else [])
    words = answer["choices"][0]["message"]["content"].split()
    assert [int(w[1:]) for w in words] == expected
    assert answer["usage"] == {"completion_tokens": NEW_TOKENS, "prompt_tokens": len(PROMPT),
                               "total_tokens": NEW_TOKENS + len(PROMPT)}  # fmt: skip
    assert set(cb.calls) == {"mixed via reference", "decode via reference"}, cb.calls
    assert sum(cb.calls.values()) == model.config.num_hidden_layers * NEW_TOKENS  # every layer of every step


def test_the_command_adds_frostcs_attention_and_the_sets_page_size(monkeypatch, tmp_path) -> None:
    """`main` registers the attention, then hands transformers' own `serve` its arguments."""
    import transformers.cli.transformers as cli

    calls = []
    monkeypatch.setattr(cli, "app", lambda args, prog_name: calls.append(args))
    assert serve.main(["MODEL", "--port", "9000"]) == 0
    assert calls == [["serve", "MODEL", "--port", "9000", "--continuous-batching", "--attn-implementation",
                      continuous.NAME]]  # fmt: skip
    assert serve.main(["MODEL", "--fuse"]) == 0  # fuses what it loads; transformers never sees the flag
    assert calls[-1] == ["serve", "MODEL", "--continuous-batching", "--attn-implementation", continuous.NAME]
    assert serve._FUSE["on"]
    serve.fuse_on_load(False)
    from transformers import AttentionInterface

    assert continuous.NAME in AttentionInterface._global_mapping
    plans, args = serve.serve_arguments(["MODEL", "--plans", "set.frostset", "--continuous-batching"])
    assert plans == "set.frostset" and args == ["MODEL", "--continuous-batching", "--attn-implementation",
                                                continuous.NAME]  # fmt: skip


@pytest.mark.parametrize(
    "argv, named",
    [
        (["MODEL", "--attn-implementation", "sdpa"], "--attn-implementation sdpa"),
        (["MODEL", "--no-continuous-batching"], "--no-continuous-batching"),
        (["MODEL", "--plans"], "--plans needs a plan set's path"),
    ],
)
def test_what_the_command_cannot_serve_is_refused(argv, named) -> None:
    with pytest.raises(SystemExit, match=named):
        serve.serve_arguments(argv)
