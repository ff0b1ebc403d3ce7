#!/usr/bin/env python3
"""Checks that a built wheel holds exactly the package's files: every file of python/gpucloud that
git tracks (or, outside a git tree, every file but caches), the compiled extension, and the
wheel's own metadata; nothing else (no second copy of a package, no stale .pyc, no build output).

    scripts/check-wheel.py WHEEL [PACKAGE_DIR]      (PACKAGE_DIR default: python/gpucloud)
"""
import pathlib
import re
import subprocess
import sys
import zipfile


def package_files(pkg: pathlib.Path) -> set:
    try:
        out = subprocess.run(["git", "-C", str(pkg), "ls-files", "-z", "."], check=True, capture_output=True).stdout
        names = [n for n in out.decode().split("\0") if n]
        if names:
            return {"gpucloud/" + n for n in names}
    except (OSError, subprocess.CalledProcessError):
        pass
    return {"gpucloud/" + p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__)
        return 2
    wheel = pathlib.Path(sys.argv[1])
    pkg = pathlib.Path(sys.argv[2] if len(sys.argv) == 3 else pathlib.Path(__file__).parents[1] / "python/gpucloud")
    with zipfile.ZipFile(wheel) as z:
        entries = [i for i in z.infolist() if not i.is_dir()]
    names = {i.filename for i in entries}
    links = [i.filename for i in entries if (i.external_attr >> 16) & 0o170000 == 0o120000]
    dist_info = {n for n in names if re.match(r"gpucloud-[^/]+\.dist-info/", n)}
    extension = {n for n in names if re.fullmatch(r"gpucloud/_core\.[^/]+\.so", n)}
    shipped = names - dist_info - extension
    want = package_files(pkg)
    problems = []
    if len(extension) != 1:
        problems.append(f"{len(extension)} compiled extensions (gpucloud/_core.*.so), expected 1")
    problems += [f"shipped but not a package file: {n}" for n in sorted(shipped - want)]
    problems += [f"a package file missing from the wheel: {n}" for n in sorted(want - shipped)]
    problems += [f"a symbolic link in the wheel: {n}" for n in links]
    for p in problems:
        print("check-wheel:", p)
    if problems:
        print(f"check-wheel: {wheel.name}: FAILED")
        return 1
    print(f"check-wheel: {wheel.name}: {len(shipped)} package files, the extension and its metadata, nothing else")
    return 0


if __name__ == "__main__":
    sys.exit(main())
