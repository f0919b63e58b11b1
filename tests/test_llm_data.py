"""deploy_opt.llm.text_data: loading text, the pydoc splits and stratified token windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from deploy_opt.llm.text_data import (  # noqa: E402
    TextDoc,
    load_texts,
    pydoc_texts,
    stratified_text_samples,
    topic_group,
)
from dopt_common.errors import ConfigError, InputError  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    import tiny_llama

    return tiny_llama.train_tokenizer()


def _write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


# ---- load_texts -------------------------------------------------------------------------------------------------


def test_load_texts_txt_jsonl_and_folder(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.txt").write_text("def f():\n    return 1\n\nprint(f())\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("Plain prose.\n", encoding="utf-8")
    (tmp_path / "readme.md").write_text("Any UTF-8 file is text.", encoding="utf-8")
    _write_jsonl(tmp_path / "mixed.jsonl", [{"text": "hello", "domain": "chat"}, {"text": "no domain"}])

    docs = load_texts([tmp_path])
    by_source = {Path(d.source).name: d for d in docs}  # jsonl sources are "file.jsonl:line"
    assert len(docs) == 5 and by_source["readme.md"].domain == "readme"
    assert by_source["a.txt"].domain == "code"  # subfolder name
    assert by_source["a.txt"].text.startswith("def f()")  # a .txt file is one document
    assert by_source["notes.txt"].domain == "notes"  # file stem
    assert by_source["mixed.jsonl:1"].domain == "chat"
    assert by_source["mixed.jsonl:2"].domain == "mixed"
    assert load_texts(tmp_path / "notes.txt") == [TextDoc(str(tmp_path / "notes.txt"), "notes", "Plain prose.\n")]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"bad\.jsonl' line 2 is not valid JSON"),
        ('["a list"]', r"line 2 needs a string field \"text\""),
        ('{"text": 3}', r"line 2 needs a string field \"text\""),
        ('{"text": "x", "domain": 7}', r"line 2: \"domain\" must be a non-empty string"),
    ],
)
def test_load_texts_bad_jsonl_line_names_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=match):
        load_texts([path])


def test_load_texts_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_texts([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    with pytest.raises(InputError, match="no text found"):
        load_texts([tmp_path / "empty.txt"])
    (tmp_path / "model.bin").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    with pytest.raises(InputError, match=r"model.bin' is a binary file, not text"):
        load_texts([tmp_path / "model.bin"])
    (tmp_path / "sub").mkdir()
    with pytest.raises(InputError, match="holds no files"):
        load_texts([tmp_path / "sub"])
    (tmp_path / "sub" / "notes").write_text("real text", encoding="utf-8")
    (tmp_path / "sub" / "weights.pt").write_bytes(b"PK\x03\x04\x00\x00")
    with pytest.raises(InputError, match=r"weights.pt' is a binary file"):
        load_texts([tmp_path / "sub"])
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        load_texts([tmp_path / "latin1.txt"])


# ---- pydoc_texts ------------------------------------------------------------------------------------------------


def test_pydoc_splits_are_disjoint_complete_and_deterministic() -> None:
    from pydoc_data.topics import topics

    calibration, evaluation = pydoc_texts("calibration"), pydoc_texts("evaluation")
    cal = {d.source for d in calibration}
    ev = {d.source for d in evaluation}
    assert not cal & ev
    assert cal | ev == {f"pydoc:{k}" for k in topics}
    # Evaluation is the tail of the topics in dict order: "the last tokens of pydoc_data.topics".
    assert [d.source for d in evaluation] == [f"pydoc:{k}" for k in list(topics)[-len(evaluation) :]]
    assert sum(len(d.text) for d in evaluation) >= 32_000
    assert pydoc_texts("evaluation") == evaluation and pydoc_texts("calibration") == calibration
    assert len({d.domain for d in calibration}) >= 5
    assert topic_group("while") == "statements" and topic_group("no-such-topic") == "other"


def test_pydoc_prompts_are_varied_instructions() -> None:
    prompts = pydoc_texts("prompts")
    assert len(prompts) == 8 and prompts == pydoc_texts("prompts")
    assert len({p.text for p in prompts}) == 8
    assert len({p.text.split()[0] for p in prompts}) >= 3  # several instruction templates
    with pytest.raises(ConfigError, match="unknown"):
        pydoc_texts("training")  # type: ignore[arg-type]


# ---- stratified_text_samples ------------------------------------------------------------------------------------


def _docs(tokenizer, n_long: int = 6, n_short: int = 6) -> list[TextDoc]:
    from pydoc_data.topics import topics

    long_texts = [topics[k] for k in ("compound", "specialnames", "types", "typesseq", "string-methods", "debugger")]
    docs = [TextDoc(f"long{i}", "prose", long_texts[i % len(long_texts)]) for i in range(n_long)]
    docs += [TextDoc(f"short{i}", "code", topics["assert"][: 300 + 40 * i]) for i in range(n_short)]
    return docs


def test_stratified_samples_counts_lengths_and_seed(tokenizer) -> None:
    docs = _docs(tokenizer)
    first = stratified_text_samples(docs, tokenizer, count=40, max_seq_len=64, seed=1)
    assert len(first.input_ids) == 40 == sum(first.counts.values())
    assert all(32 <= len(ids) <= 64 for ids in first.input_ids)
    assert set(first.counts) <= set(first.available)
    assert all(key.split("/")[0] in {"prose", "code"} for key in first.counts)
    assert all(first.counts[k] <= first.available[k] for k in first.counts)
    assert sum(first.domain_share.values()) == pytest.approx(1.0)
    # Windows are real token slices of the documents, in order.
    text = tokenizer.decode(list(first.input_ids[0]))
    assert any(text in d.text for d in docs)

    again = stratified_text_samples(docs, tokenizer, count=40, max_seq_len=64, seed=1)
    other = stratified_text_samples(docs, tokenizer, count=40, max_seq_len=64, seed=2)
    assert again == first
    assert other.sample_hash != first.sample_hash
    assert any("below the recommended 128" in w for w in first.warnings)
    tensors = first.tensors()
    assert tensors[0].shape == (1, len(first.input_ids[0]))
    assert first.to_report()["samples"] == 40


def test_packed_windows_are_full_and_cut_from_each_domain_joined(tokenizer) -> None:
    """windows: packed joins each domain's documents (a blank line between) and cuts full windows, so the short
    'code' documents give full windows too; every window is a slice of its domain's joined tokens."""
    docs = _docs(tokenizer)
    packed = stratified_text_samples(docs, tokenizer, count=40, max_seq_len=64, seed=1, windows="packed")
    per_doc = stratified_text_samples(docs, tokenizer, count=40, max_seq_len=64, seed=1)
    assert all(len(ids) == 64 for ids in packed.input_ids)
    assert any(len(ids) < 64 for ids in per_doc.input_ids)
    assert set(packed.domain_share) == {"prose", "code"}

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    separator = encode("\n\n")
    joined = {
        domain: [t for d in docs if d.domain == domain for t in encode(d.text) + separator]
        for domain in packed.domain_share
    }
    spans_two = 0
    for sample_id, ids in zip(packed.sample_ids, packed.input_ids, strict=True):
        domain, start = sample_id.split(" (packed)@")
        assert list(ids) == joined[domain][int(start) : int(start) + 64]
        inner = [list(ids[k : k + len(separator)]) for k in range(1, 64 - len(separator))]
        spans_two += separator in inner
    assert spans_two > 0  # some window holds the end of one document and the start of the next


def test_document_windows_are_slices_of_each_document_s_own_tokens(tokenizer) -> None:
    """The documents are tokenized in one batch; each window is still its document's tokens alone, from its start
    (the first token may be BOS: ``with_bos``)."""
    docs = {doc.source: doc for doc in _docs(tokenizer)}
    chosen = stratified_text_samples(list(docs.values()), tokenizer, count=40, max_seq_len=64, seed=1)
    for sample_id, ids in zip(chosen.sample_ids, chosen.input_ids, strict=True):
        source, start = sample_id.rsplit("@", 1)
        own = tokenizer(docs[source].text, add_special_tokens=False)["input_ids"]
        assert list(ids[1:]) == own[int(start) + 1 : int(start) + 64]


def test_stratified_samples_warn_when_one_domain_dominates(tokenizer) -> None:
    docs = _docs(tokenizer, n_long=6, n_short=1)
    selection = stratified_text_samples(docs, tokenizer, count=30, max_seq_len=64)
    assert selection.domain_share["prose"] > 0.5
    assert any("domain 'prose'" in w and "fix:" in w for w in selection.warnings)


def test_stratified_samples_warn_on_short_data_and_long_max_seq_len(tokenizer) -> None:
    docs = [TextDoc("s", "code", "x = 1\n" * 40)]
    selection = stratified_text_samples(docs, tokenizer, count=500, max_seq_len=4096, min_tokens=8)
    longest = max(len(ids) for ids in selection.input_ids)
    assert any(f"longer than the longest calibration sample ({longest} tokens)" in w for w in selection.warnings)
    assert any("only 1 exist" in w for w in selection.warnings)
    assert any("(the only domain)" in w for w in selection.warnings)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"count": 0}, ConfigError, "out of range"),
        ({"count": 100_001}, ConfigError, "out of range"),
        ({"max_seq_len": 0}, ConfigError, "max_seq_len"),
        ({"min_tokens": 10_000}, ConfigError, "min_tokens"),
        ({"min_tokens": 512}, InputError, "no document has 512 tokens"),
    ],
)
def test_stratified_samples_refuse_bad_settings(tokenizer, kwargs, error, match) -> None:
    docs = [TextDoc("s", "code", "print('hello world')\n" * 5)]
    with pytest.raises(error, match=match):
        stratified_text_samples(docs, tokenizer, **kwargs)


def test_text_files_of_any_suffix_are_read_as_documents(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "GPL-3").write_text("GNU GENERAL PUBLIC LICENSE", encoding="utf-8")
    (tmp_path / "corpus" / ".hidden").write_bytes(b"\x00\x01")  # hidden files are not data
    docs = load_texts([tmp_path / "data.csv", tmp_path / "corpus"])
    assert [(Path(d.source).name, d.domain) for d in docs] == [("data.csv", "data"), ("GPL-3", "GPL-3")]
    licenses = Path("/usr/share/common-licenses")
    if licenses.is_dir():  # Debian's license texts: no suffix at all
        assert len(load_texts([licenses])) >= 5
