"""A deterministic hostile corpus for the fault campaign (bench/faults.py, tests/test_fault_campaign.py).

`build(dest, spec)` writes good documents of every supported type next to zero-byte, truncated and
random-byte files under every supported extension, an encrypted PDF, a PDF of blank pages, pixel bombs, a zip
bomb named .docx, a file of `big_mb` MB, a single line of `single_line_mb` MB, invalid UTF-8 and NUL bytes,
odd file names, symlink loops, links out of the source folder and an HTML page carrying a huge base64
image (the files are made in bench/hostile_files.py). It returns what each file may become: `indexed`,
`quarantined`, `skipped` (never seen as a document) or a set of those. `corrupt_in_place` then damages good
documents that were indexed before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.hostile_files import (
    IMAGE_EXTS,
    WORDS,
    office_bytes,
    pdf_bytes,
    pixel_bomb,
    prose,
    valid_sample,
    zip_bomb_docx,
)

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "examples" / "sample-corpus"
GOOD_SAMPLES = ["docs/contract-terms.md", "en/Normans.md", "zh/DEV_0.txt", "zh/DEV_1.txt"]
TEXT_EXTS = {".txt", ".text", ".md", ".markdown", ".html", ".htm", ".csv", ".tsv"}
LEGACY_EXTS = {".doc", ".xls", ".ppt"}
INDEXED, QUARANTINED, SKIPPED = "indexed", "quarantined", "skipped"
EITHER = frozenset({INDEXED, QUARANTINED})
NOT_INDEXED = frozenset({QUARANTINED, SKIPPED})
VICTIMS = ("good/victim.docx", "good/victim.pdf")


@dataclass(frozen=True)
class HostileSpec:
    """Sizes of the expensive inputs: the reduced (CI) form and the full form differ only here."""

    seed: int = 15
    big_mb: int = 20             # the "hundreds of MB" file (full: 300, above the 200 MB default limit)
    blank_pages: int = 300       # the PDF of blank pages (full: 2,000)
    bomb_mb: int = 200           # uncompressed size of the zip bomb named .docx (full: 2,048)
    single_line_mb: float = 0.1  # the single-line text file (full: 5)
    base64_mb: float = 2.0       # the base64 image inside an HTML page (full: 20)
    large_side: int = 6000       # a pixel bomb PIL does not refuse (side x side RGB; full: 12,000)
    good_images: bool = False    # a good image of every format (OCR: seconds each), not only PNG

    @classmethod
    def full(cls) -> HostileSpec:
        return cls(big_mb=300, blank_pages=2000, bomb_mb=2048, single_line_mb=5.0, base64_mb=20.0,
                   large_side=12000, good_images=True)


Expect = str | frozenset[str]


def supported_extensions() -> list[str]:
    from tasks.parse import PARSERS

    return sorted(PARSERS)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def shown_path(rel: str) -> str:
    """The path as corpusync reports a file name that is not UTF-8 (surrogates as \\xNN)."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _write(root: Path, rel: str | bytes, data: bytes) -> None:
    path = os.path.join(os.fsencode(root), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def build_good(dest: Path, seed: int = 15, every_image: bool = False) -> dict[str, Expect]:
    """Good documents: sample-corpus copies and a valid file of every supported extension but legacy Office;
    the victims (corrupted later) among them."""
    rng = random.Random(seed)
    expect: dict[str, Expect] = {}
    for rel in GOOD_SAMPLES:
        (dest / "good").mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLE / rel, dest / "good" / Path(rel).name)
        expect[f"good/{Path(rel).name}"] = INDEXED
    for ext in supported_extensions():
        data = valid_sample(ext, rng, f"Sample {ext[1:]} document {rng.randrange(10**6)}")
        if data is not None and (every_image or ext not in IMAGE_EXTS - {".png"}):
            _write(dest, f"good/sample{ext}", data)
            expect[f"good/sample{ext}"] = INDEXED
    for victim in VICTIMS:
        data = valid_sample(Path(victim).suffix, rng, f"Victim {victim} first version")
        assert data is not None
        _write(dest, victim, data)
        expect[victim] = INDEXED
    return expect


def build(dest: Path, spec: HostileSpec, outside: Path) -> dict[str, Expect]:
    """Add every hostile kind under dest (good documents must already be there: build_good). `outside` is a
    folder beyond dest that links point into. Returns the allowed verdicts per path (as reported)."""
    rng = random.Random(spec.seed)
    expect: dict[str, Expect] = {}
    for ext in supported_extensions():
        _write(dest, f"zero/empty{ext}", b"")
        expect[f"zero/empty{ext}"] = QUARANTINED
        sample = valid_sample(ext, rng, f"Truncated {ext[1:]}") or rng.randbytes(20000)
        _write(dest, f"truncated/half{ext}", sample[: len(sample) // 2])
        expect[f"truncated/half{ext}"] = EITHER if ext in TEXT_EXTS | IMAGE_EXTS | {".pdf"} else QUARANTINED
        _write(dest, f"random/bytes{ext}", rng.randbytes(64 * 1024))
        expect[f"random/bytes{ext}"] = EITHER if ext in TEXT_EXTS else QUARANTINED
    import pymupdf

    doc = pymupdf.open(stream=valid_sample(".pdf", rng, "Secret encrypted report"), filetype="pdf")
    aes256 = getattr(pymupdf, "PDF_ENCRYPT_AES_256", 5)
    _write(dest, "pdf/encrypted.pdf", doc.tobytes(encryption=aes256, user_pw="secret", owner_pw="owner"))
    doc.close()
    _write(dest, "pdf/blank-pages.pdf", pdf_bytes([""] * spec.blank_pages))
    expect |= {"pdf/encrypted.pdf": QUARANTINED, "pdf/blank-pages.pdf": QUARANTINED}
    (dest / "bombs").mkdir(parents=True, exist_ok=True)
    pixel_bomb(dest / "bombs/pixel-bomb.png", 60000)
    pixel_bomb(dest / "bombs/pixel-large.png", spec.large_side, bit_depth=8)
    zip_bomb_docx(dest / "bombs/zip-bomb.docx", spec.bomb_mb)
    expect |= {"bombs/pixel-bomb.png": QUARANTINED, "bombs/pixel-large.png": QUARANTINED,
               "bombs/zip-bomb.docx": QUARANTINED}
    block = (prose(rng, 150) + "\n\n").encode()
    with (dest / "bombs/huge.txt").open("wb") as fh:
        for _ in range(spec.big_mb * (1 << 20) // len(block) + 1):
            fh.write(block)
    expect["bombs/huge.txt"] = QUARANTINED  # above max_file_bytes (the campaign sets it below big_mb)
    line = " ".join(rng.choice(WORDS) for _ in range(int(spec.single_line_mb * (1 << 20) / 7)))
    _write(dest, "text/single-line.txt", line.encode())
    good = "Invoice 2024-17 payment terms: thirty days. 付款方式：银行转账。"
    _write(dest, "text/invalid-utf8.txt", (good + "\n\n").encode() + b"bad \xff\xfe\xc3\x28 bytes \xed\xa0\x80 end\n"
           + ("\n\n" + good).encode())
    _write(dest, "text/nul-early.txt", b"NUL\x00 near the start " + (good * 20).encode())
    _write(dest, "text/nul-late.md", ("# Late NUL\n\n" + good * 200).encode() + b"\x00 after the sniffed part\n")
    expect |= {"text/single-line.txt": EITHER, "text/invalid-utf8.txt": EITHER, "text/nul-early.txt": EITHER,
               "text/nul-late.md": EITHER}
    payload = base64.b64encode(rng.randbytes(int(spec.base64_mb * (1 << 20) * 3 / 4))).decode()
    _write(dest, "html/base64-image.html", (f"<html><body><h1>Quarterly letter</h1><p>{good}</p>"
                                            f'<img src="data:image/png;base64,{payload}"><p>Signed.</p>'
                                            "</body></html>").encode())
    expect["html/base64-image.html"] = EITHER
    expect |= _odd_names(dest, rng) | _links(dest, outside)
    return expect


def _odd_names(dest: Path, rng: random.Random) -> dict[str, Expect]:
    names = ["name with  spaces.md", "中文 文件名.txt", "emoji-😀.md", "-rf.txt", "quote'\"$(echo x).md",
             "semi;colon&amp.txt", "percent%s%n.txt", "back\\slash.txt", "new\nline.txt", "tab\tname.md",
             "café-nfc.md", "cafe\u0301-nfd.md", "UPPER.TXT", "trailing.dot.", "no-extension", "l" * 240 + ".txt",
             ".hidden.md"]
    expect: dict[str, Expect] = {}
    for name in names:
        _write(dest, f"odd/{name}", f"# {name!r}\n\n{prose(rng, 60)}\n".encode())
        expect[f"odd/{name}"] = INDEXED
    expect["odd/trailing.dot."] = expect["odd/no-extension"] = NOT_INDEXED  # no parser for the extension
    expect["odd/.hidden.md"] = SKIPPED  # hidden files are excluded by default
    _write(dest, b"odd/bad-\xff\xfe.txt", b"a name that is not UTF-8\n")
    expect[shown_path(os.fsdecode(b"odd/bad-\xff\xfe.txt"))] = QUARANTINED
    deep = "odd/" + "/".join(["d" * 200] * 12) + "/deep.txt"  # a path over the identity limit
    try:
        _write(dest, deep, b"deep\n")
        expect[deep[:200] + "…"] = QUARANTINED
    except OSError:
        pass
    return expect


def _links(dest: Path, outside: Path) -> dict[str, Expect]:
    links = dest / "links"
    links.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret.md").write_text("# Outside the source folder\n\nmust never be indexed\n")
    (links / "loop-dir").symlink_to(".")
    (links / "loop-a.txt").symlink_to("loop-b.txt")
    (links / "loop-b.txt").symlink_to("loop-a.txt")
    (links / "self.md").symlink_to("self.md")
    (links / "dangling.md").symlink_to("does-not-exist.md")
    (links / "etc-passwd.txt").symlink_to("/etc/passwd")
    (links / "outside.md").symlink_to(outside / "secret.md")
    (links / "outside-dir").symlink_to(outside)
    (links / "inside.md").symlink_to("../good/contract-terms.md")
    return {"links/loop-a.txt": NOT_INDEXED, "links/loop-b.txt": NOT_INDEXED, "links/self.md": NOT_INDEXED,
            "links/dangling.md": NOT_INDEXED, "links/etc-passwd.txt": QUARANTINED, "links/outside.md": QUARANTINED,
            "links/outside-dir/secret.md": SKIPPED, "links/loop-dir/inside.md": SKIPPED, "links/inside.md": INDEXED}


def corrupt_in_place(dest: Path, seed: int = 15) -> list[str]:
    """Damage the victims after they were indexed: the DOCX loses its tail (and its zip directory), the
    PDF's body becomes random bytes behind its header."""
    rng = random.Random(seed + 1)
    docx_path, pdf_path = dest / VICTIMS[0], dest / VICTIMS[1]
    data = docx_path.read_bytes()
    docx_path.write_bytes(data[: len(data) // 3])
    size = pdf_path.stat().st_size
    pdf_path.write_bytes(b"%PDF-1.7\n" + rng.randbytes(size))
    return list(VICTIMS)


# ------------------------------------------------------------------------------------------------------
# the two corpus states the kill campaign alternates between (A -> B -> A ...)

STATE_BASE = ["en/Super_Bowl_50.md", "en/Normans.md", "zh/DEV_0.txt", "zh/DEV_1.txt", "zh/DEV_2.txt",
              "docs/contract-terms.md"]
STATE_CHANGED = ["en/Amazon_rainforest.md", "zh/DEV_3.txt"]


def campaign_states(seed: int = 15) -> dict[str, dict[str, bytes]]:
    """A and B: B changes four documents (text, PDF, DOCX), deletes two, adds two and renames one, keeping
    the gold documents. The bytes are made once, so the same state always has the same hashes."""
    rng = random.Random(seed)
    base = {rel: (SAMPLE / rel).read_bytes() for rel in STATE_BASE + STATE_CHANGED}
    moved = f"# Moving document\n\n{prose(rng, 150)}\n\n## Later\n\n{prose(rng, 150)}\n".encode()
    a = dict(base) | {
        "gen/a-only-1.md": f"# Only in A\n\n{prose(rng, 200)}\n".encode(),
        "gen/a-only-2.txt": f"Only in A, plain text.\n\n{prose(rng, 200)}\n".encode(),
        "gen/report.pdf": pdf_bytes([f"Report A page {i}\n\n{prose(rng, 180)}" for i in range(1, 5)]),
        "gen/notes.docx": office_bytes(".docx", "Notes, first draft", prose(rng, 250)),
        "gen/move-me.md": moved,
    }
    b = {k: v for k, v in a.items() if not k.startswith("gen/a-only") and k != "gen/move-me.md"} | {
        "en/Amazon_rainforest.md": base["en/Amazon_rainforest.md"]
        + f"\n\n## Addendum\n\n{prose(rng, 120)}\n".encode(),
        "zh/DEV_3.txt": base["zh/DEV_3.txt"] + "\n\n补充说明：本段为第二版新增内容。\n".encode(),
        "gen/report.pdf": pdf_bytes([f"Report B page {i}\n\n{prose(rng, 180)}" for i in range(1, 6)]),
        "gen/notes.docx": office_bytes(".docx", "Notes, second draft", prose(rng, 260)),
        "gen/b-only-1.md": f"# Only in B\n\n{prose(rng, 220)}\n".encode(),
        "gen/b-only-2.csv": ("id,item,note\n" + "".join(f"{i},{rng.choice(WORDS)},{prose(rng, 6)}\n"
                                                         for i in range(40))).encode(),
        "gen/moved/move-me.md": moved,
    }
    return {"A": a, "B": b}


def write_state(src: Path, files: dict[str, bytes]) -> None:
    """Make src hold exactly `files` (unchanged files are not rewritten)."""
    for path in sorted(src.rglob("*"), reverse=True):
        rel = path.relative_to(src).as_posix()
        if path.is_file() and rel not in files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    for rel, data in files.items():
        target = src / rel
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def write_goldset(path: Path) -> Path:
    """The demo gold set's questions whose gold documents both states keep."""
    keep = set(STATE_BASE + STATE_CHANGED)
    lines = [line for line in (REPO / "examples/goldset.jsonl").read_text(encoding="utf-8").splitlines()
             if line.strip() and json.loads(line).get("gold_document") in keep]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------------
# (b) the hostile phase of the campaign

MIB = 1 << 20
DIRTY = """SELECT DISTINCT source_path FROM corpusync.live_chunks
           WHERE (source_path = 'html/base64-image.html' AND text ~ '[A-Za-z0-9+/=]{200,}')
              OR text LIKE '%%must never be indexed%%'"""


def run_hostile(c: Any) -> dict[str, Any]:
    """Index good documents, then add the hostile corpus and corrupt two good documents in place: the run
    must survive, each file be indexed correctly or quarantined with a reason, the previous good versions
    stay live, and the process tree stay under the RSS bound."""
    import time

    from bench.fault_campaign import default_pool, tree_budget_mib
    from bench.fault_procs import content, home_url

    spec = HostileSpec.full() if c.cfg.full else HostileSpec(seed=c.cfg.seed)
    home, src, outside = c.root / "home-hostile", c.root / "hostile" / "src", c.root / "hostile" / "outside"
    src.mkdir(parents=True)
    env = default_pool() | ({} if c.cfg.full else {"CORPUSYNC_PARSE_TIMEOUT_S": "60"})
    env["CORPUSYNC_MODEL_LINGER_S"] = "0"  # the model in the refresh's own tree: the memory bound covers it
    if spec.big_mb * MIB <= 200 * MIB:  # below the default limit: lower the limit so the big file exceeds it
        env["CORPUSYNC_MAX_FILE_BYTES"] = str(spec.big_mb * MIB * 3 // 4)
    expect = build_good(src, spec.seed, spec.good_images)
    first = c.run(home, "hostile: good documents", src, env=env)
    rec: dict[str, Any] = {"spec": vars(spec), "env": env, "good_run": first.brief()}
    if first.rc != 0:
        rec.update(ok=False, table=[f"  the refresh of the good documents failed: {first.brief()}"])
        return rec
    url = home_url(home)
    before = content(url)
    t0 = time.monotonic()
    expect |= build(src, spec, outside)
    corrupt_in_place(src, spec.seed)
    rec["generate_s"] = round(time.monotonic() - t0, 1)
    proc = c.refresh(home, src, env=env, tag="hostile", sample_s=0.1)  # its peak is held to the bound
    out = c.finish(proc, "hostile corpus")
    rec["run"] = out.brief() | {"stderr_tail": out.stderr_tail[-1500:] if out.rc else "",
                                "profile": proc.parse_profile()}
    if out.rc != 0 and "links" in out.stderr_tail.lower():
        # a link crashed the run: note it, then see how the rest of the corpus fares without the links
        shutil.rmtree(src / "links")
        expect = {k: v for k, v in expect.items() if not k.startswith("links/")}
        proc = c.refresh(home, src, env=env, tag="hostile-without-links", sample_s=0.1)
        out = c.finish(proc, "hostile corpus, no links")
        rec["run_without_links"] = out.brief() | {"stderr_tail": out.stderr_tail[-1500:] if out.rc else "",
                                                  "profile": proc.parse_profile()}
    after = content(url)
    quarantined = {q["path"]: f"{q['stage']}:{q['reason']}" for q in (out.summary or {}).get("quarantined", [])}
    verdicts: dict[str, dict[str, Any]] = {}
    for path, allowed in expect.items():
        if path in VICTIMS:
            ok = path in quarantined and after.docs.get(path) == before.docs.get(path)
            verdicts[path] = {"verdict": "quarantined, previous version live" if ok else
                              f"{quarantined.get(path, 'not quarantined')}, live changed", "ok": ok}
            continue
        if path in quarantined:
            verdict, detail = QUARANTINED, quarantined[path]
        elif path in after.docs:
            fresh = (src / path).exists() and sha256_of(src / path) == after.docs[path][0]
            verdict, detail = (INDEXED, "") if fresh else ("stale", "an older content is live")
        else:
            verdict, detail = SKIPPED, ""
        allowed_set = {allowed} if isinstance(allowed, str) else set(allowed)
        verdicts[path] = {"verdict": verdict, "detail": detail, "ok": verdict in allowed_set,
                          "allowed": sorted(allowed_set)}
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        dirty = [r[0] for r in conn.execute(DIRTY).fetchall()]
    unexpected = sorted((set(after.docs) | set(quarantined)) - set(expect))
    good_kept = [p for p, d in before.docs.items() if after.docs.get(p) != d]
    rerun = c.run(home, "hostile corpus again (no change)", src, env=env)
    bound = c.cfg.rss_bound_mib or tree_budget_mib(_parse_workers(env))
    rec.update(verdicts=verdicts, dirty_chunks=dirty, unexpected=unexpected, good_changed=good_kept,
               rerun=rerun.brief() | {"parse_s": ((rerun.summary or {}).get("timings") or {}).get("parse")},
               peak_pss_mib=out.peak_rss >> 20, peak_rss_sum_mib=out.peak_rss_sum >> 20, rss_bound_mib=bound)
    wrong = {p: v for p, v in verdicts.items() if not v["ok"]}
    survived = out.rc == 0 and out.status in ("published", "no_changes") and "run_without_links" not in rec
    rec["ok"] = bool(survived and not wrong and not dirty and not unexpected and not good_kept
                     and out.peak_rss >> 20 <= bound and rerun.rc == 0)
    profile = proc.parse_profile()
    by_verdict = Counter(v["verdict"] for v in verdicts.values())
    reasons = Counter(v.get("detail") for v in verdicts.values() if v["verdict"] == QUARANTINED)
    rec["table"] = [
        f"  {len(verdicts)} files: " + ", ".join(f"{k} {n}" for k, n in sorted(by_verdict.items()))
        + f"; wrong verdicts {len(wrong)}",
        "  quarantine reasons: " + ", ".join(f"{k} {n}" for k, n in reasons.most_common()),
        f"  run survived: {'yes' if survived else 'NO'} (rc {rec['run']['rc']}"
        + (f"; without links/: rc {rec['run_without_links']['rc']}" if "run_without_links" in rec else "") + ")"
        + f"; good documents unchanged: {good_kept if good_kept else 'yes'}; chunks with base64 or outside "
        f"text: {dirty or 'none'}; unexpected documents: {unexpected or 'none'}",
        f"  peak memory of the process tree {out.peak_rss >> 20} MiB PSS (bound {bound} MiB; summed RSS "
        f"{out.peak_rss_sum >> 20} MiB) in {profile['peak_stage']}"
        + (f" (next file done: {profile['peak_file']})" if profile["peak_file"] else "")
        + f"; at the peak, MiB PSS: {proc.peak_breakdown()}"
        + f"; wall {out.wall:.0f} s (timings {(out.summary or {}).get('timings')})",
        "  slowest to parse: " + ", ".join(f"{p} {t} s" for p, t in profile["slowest"]),
        f"  rerun: rc {rerun.rc} {rerun.status}, parse {rec['rerun']['parse_s']} s",
        *[f"  WRONG {p!r}: {v['verdict']} {v.get('detail', '')} (allowed {v.get('allowed', 'quarantined')})"
          for p, v in list(wrong.items())[:25]],
    ]
    return rec


def _parse_workers(env: dict[str, str]) -> int:
    """The parse workers the hostile refresh runs with (its setting, else one per usable CPU)."""
    from tasks.parse_worker import default_workers

    configured = int(env.get("CORPUSYNC_PARSE_WORKERS") or os.environ.get("CORPUSYNC_PARSE_WORKERS") or 0)
    return configured or default_workers()
