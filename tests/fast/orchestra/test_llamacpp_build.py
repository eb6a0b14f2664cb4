"""A tiny GGUF for the llamacpp engine is one command."""

from __future__ import annotations


def test_a_tiny_gguf_for_the_llamacpp_engine_is_one_command(tmp_path, capsys, monkeypatch):
    from gguf import GGUFReader

    from agents.orchestra.engines.llamacpp import build as llamacpp_build
    from agents.orchestra.engines.llamacpp import tiny_gguf

    monkeypatch.setattr(llamacpp_build, "vocab_file", lambda: None)  # no build yet: it says what to run
    assert tiny_gguf.main([str(tmp_path / "t.gguf")]) == 1
    assert "make llama-server" in capsys.readouterr().err
    monkeypatch.undo()
    if llamacpp_build.vocab_file() is None:
        import pytest

        pytest.skip("no llama-server build here: its tokenizer file is what the tiny model needs")
    assert tiny_gguf.main([str(tmp_path / "t.gguf"), "--lora", str(tmp_path / "l.gguf")]) == 0
    out = capsys.readouterr().out
    assert f"-m {tmp_path / 't.gguf'}" in out and "engine: llamacpp" in out
    assert GGUFReader(str(tmp_path / "t.gguf")).fields["general.architecture"] is not None and (tmp_path / "l.gguf").exists()
