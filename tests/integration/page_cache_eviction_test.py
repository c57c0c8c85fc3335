"""bench/pipeline_gpu_generate.py --cold's helpers on files the test writes: page_cache_fraction finds a file it
has just read in the page cache, evict_page_cache drops every file of a folder (its subfolders too) from it, and
reading them again brings them back; disk_read reads the disk past the page cache (O_DIRECT), every byte of its
ranges, and leaves nothing cached. Files go under the directory given (the build tree, on disk: tmpfs keeps its
pages, as it must). Exits non-zero on the first wrong figure."""
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import pipeline_gpu_generate as bench  # noqa: E402


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def main() -> int:
    parent = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix="page-cache-") as folder:
        root = pathlib.Path(folder)
        (root / "transformer").mkdir()
        (root / "empty.json").write_text("")  # no pages: counted as nothing, not as a division by zero
        sizes = {root / "model.safetensors": 3 * 1024 * 1024 + 17, root / "transformer" / "part.bin": 1024 * 1024}
        for path, size in sizes.items():
            path.write_bytes(os.urandom(size))
        files = bench.folder_files(folder)
        check(sorted(files) == sorted([root / "empty.json", *sizes]), "folder_files lists every file, subfolders too")
        for path in sizes:
            path.read_bytes()
        check(bench.page_cache_fraction(files) > 0.99, "written and read files are in the page cache")
        left = bench.evict_page_cache(folder)
        check(left < 0.05, f"evict_page_cache drops them ({100 * left:.1f}% left)")
        (root / "model.safetensors").read_bytes()
        whole = bench.page_cache_fraction(files)
        page = os.sysconf("SC_PAGE_SIZE")
        pages = {path: -(-size // page) for path, size in sizes.items()}
        expected = pages[root / "model.safetensors"] / sum(pages.values())
        check(abs(whole - expected) < 0.02,
              f"reading one file back brings its pages alone ({100 * whole:.1f}%, {100 * expected:.1f}% expected)")
        big = root / "transformer" / "big.safetensors"  # the largest weight file: what disk_read reads
        big.write_bytes(os.urandom(40 << 20))
        bench.evict_page_cache(folder)
        for readers in (1, 4):
            done, seconds = bench.disk_read(folder, readers, 32 << 20)
            check(done == 32 << 20 and seconds > 0,
                  f"disk_read with {readers} reader(s) reads the limit's bytes ({done})")
        check(bench.page_cache_fraction([big]) < 0.05, "disk_read reads past the page cache: nothing of it cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
