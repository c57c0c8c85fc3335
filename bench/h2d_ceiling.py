"""The host-to-device ceiling the weight loader works under (GPU machine; LibTorch's own Python build): how fast
pinned memory reaches the GPU, how fast threads copy a file out of the page cache, and both at once, the way
diffpipe's loader does it (io/parallel_load.h: each reader preads a piece into one of its two pinned chunks and
sends it on its own copy stream). Set beside the loader's logged rate (27-40 GB/s for FLUX's 23.8 GB transformer
on H100 and H200 hosts), it says whether the loader or the machine is the limit.
    python3 bench/h2d_ceiling.py [--file PATH] [--gigabytes 8] [--piece-mb 8]
Writes PATH (default /tmp/h2d_ceiling.bin) once, so it is in the page cache, and leaves it. Figures only.
"""
import argparse
import os
import threading
import time

import torch


def rate(nbytes, seconds):
    return f"{nbytes / seconds / 1e9:6.1f} GB/s"


def pinned_to_device(total, streams, piece):
    """Pinned host memory to the GPU: `streams` streams each sending its share in `piece`-byte copies."""
    host = torch.empty(total, dtype=torch.uint8).pin_memory()
    device = torch.empty(total, dtype=torch.uint8, device="cuda")
    stream_list = [torch.cuda.Stream() for _ in range(streams)]
    device[:piece].copy_(host[:piece], non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for index, offset in enumerate(range(0, total, piece)):
        with torch.cuda.stream(stream_list[index % streams]):
            end = min(offset + piece, total)
            device[offset:end].copy_(host[offset:end], non_blocking=True)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def page_cache_reads(path, total, threads, piece, to_device):
    """`threads` readers pread the file in `piece`-byte pieces into two pinned chunks each; with `to_device`, each
    chunk is then sent on the reader's own stream and reused once that copy is done (the loader's scheme)."""
    device = torch.empty(total, dtype=torch.uint8, device="cuda") if to_device else None
    pieces = list(range(0, total, piece))
    next_piece = [0]
    lock = threading.Lock()
    fd = os.open(path, os.O_RDONLY)

    # Pinned before the clock starts: pinning costs about 0.8 ms a megabyte, which is not a reading rate.
    staging = [[torch.empty(piece, dtype=torch.uint8).pin_memory() for _ in range(2)] for _ in range(threads)]

    def reader(chunks):
        views = [memoryview(chunk.numpy()) for chunk in chunks]
        done = [None, None]
        stream = torch.cuda.Stream() if to_device else None
        turn = 0
        while True:
            with lock:
                if next_piece[0] >= len(pieces):
                    break
                offset = pieces[next_piece[0]]
                next_piece[0] += 1
            length = min(piece, total - offset)
            if done[turn] is not None:
                done[turn].synchronize()
            got = os.preadv(fd, [views[turn][:length]], offset)
            assert got == length, (got, length)
            if to_device:
                with torch.cuda.stream(stream):
                    device[offset:offset + length].copy_(chunks[turn][:length], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(stream)
                done[turn] = event
            turn = 1 - turn
        torch.cuda.synchronize()

    workers = [threading.Thread(target=reader, args=(chunks,)) for chunks in staging]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    os.close(fd)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", default="/tmp/h2d_ceiling.bin")
    parser.add_argument("--gigabytes", type=float, default=8)
    parser.add_argument("--piece-mb", type=int, default=8)
    args = parser.parse_args()
    total = int(args.gigabytes * 1e9) // (1 << 20) * (1 << 20)
    piece = args.piece_mb << 20
    if not os.path.exists(args.file) or os.path.getsize(args.file) < total:
        block = os.urandom(1 << 20) * 64
        with open(args.file, "wb") as out:
            for _ in range(0, total, len(block)):
                out.write(block)
    with open(args.file, "rb") as warm:  # into the page cache
        while warm.read(1 << 26):
            pass
    print(f"{torch.cuda.get_device_name()}, {total / 1e9:.1f} GB, pieces of {args.piece_mb} MB")
    for streams in (1, 2, 4, 16):
        seconds = pinned_to_device(total, streams, piece)
        print(f"pinned host to device, {streams:2d} stream(s):           {rate(total, seconds)}")
    seconds = pinned_to_device(total, 1, 1 << 30)
    print(f"pinned host to device, 1 stream, 1 GB copies:     {rate(total, seconds)}")
    for threads in (4, 8, 16):
        seconds = page_cache_reads(args.file, total, threads, piece, to_device=False)
        print(f"page cache to pinned chunks, {threads:2d} threads:       {rate(total, seconds)}")
    for threads in (4, 8, 16):
        seconds = page_cache_reads(args.file, total, threads, piece, to_device=True)
        print(f"both, the loader's scheme, {threads:2d} readers:          {rate(total, seconds)}")
    for piece_mb in (32, 64):
        seconds = page_cache_reads(args.file, total, 16, piece_mb << 20, to_device=True)
        print(f"both, 16 readers, {piece_mb} MB pieces:                {rate(total, seconds)}")


if __name__ == "__main__":
    main()
