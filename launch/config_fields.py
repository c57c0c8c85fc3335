"""The fields of a run config (configs/*.json) that the launch scripts need, checked, for bash to read.

    python3 launch/config_fields.py CONFIG

Prints, each followed by a NUL byte (empty when the key is absent): ranks, device, out, output-type, report,
report-json. Exits 2 with one line "CONFIG: what is wrong" on stderr for anything generate would refuse too,
so that a launch fails before any rank starts: not valid JSON, not an object, a key given twice, "ranks" that is
not a whole number of ranks (1e23, 2.5, "2", true), a path or name that is not a string.
"""
import json
import sys

MAX_RANKS = 100000


def refuse(path, message):
    print(f"{path}: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 2:
        print("usage: config_fields.py CONFIG", file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1]

    def no_duplicates(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                refuse(path, f'key "{key}" appears twice (JSON would quietly keep the last one); give each key once')
            seen.add(key)
        return dict(pairs)

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, object_pairs_hook=no_duplicates)
    except OSError as e:
        refuse(path, f"cannot read it ({e.strerror})")
    except (ValueError, UnicodeDecodeError) as e:
        refuse(path, f"not valid JSON ({e})")
    if not isinstance(doc, dict):
        kind = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(doc), "null")
        refuse(path, f'a run config is a JSON object of generate\'s flags ({{"steps": 4, "ranks": 2}}), got {kind}')

    fields = []
    ranks = doc.get("ranks")
    if ranks is None:
        fields.append("")
    elif isinstance(ranks, bool) or not isinstance(ranks, int) or not 0 <= ranks <= MAX_RANKS:
        refuse(path, f'key "ranks": expected a whole number of ranks from 0 (any) to {MAX_RANKS}, got {json.dumps(ranks)}')
    else:
        fields.append(str(ranks))
    device = doc.get("device")
    if device is not None and device not in ("cpu", "cuda"):
        refuse(path, f'key "device": expected "cpu" or "cuda", got {json.dumps(device)}')
    fields.append(device or "")
    for key in ("out", "output-type", "report", "report-json"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, str) or not value or "\0" in value):
            refuse(path, f'key "{key}": expected a non-empty string, got {json.dumps(value)}')
        fields.append(value or "")
    sys.stdout.write("".join(field + "\0" for field in fields))


if __name__ == "__main__":
    main()
