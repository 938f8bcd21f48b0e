"""python -m libckpt: the command-line tools, found beside the library.

    python -m libckpt --help              the tools and where they are
    python -m libckpt inspect ROOT list   runs ckpt-inspect ROOT list
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import List, Optional

TOOLS = {
    "inspect": ("ckpt-inspect", "list, show, verify, diff, gc and rebuild checkpoints"),
    "reshard": ("ckpt-reshard", "rewrite a step for another world size; safetensors "
                                "export and import"),
    "synth": ("ckpt-synth", "a deterministic synthetic job: save as W ranks, verify "
                            "as W'"),
}


def find_tool(exe: str) -> Optional[str]:
    """The tool's path: LIBCKPT_TOOLS_DIR, beside the loaded library (a build tree's
    tools/<name>/, an installed prefix's bin/), then PATH."""
    dirs: List[str] = []
    env = os.environ.get("LIBCKPT_TOOLS_DIR")
    if env:
        dirs.append(env)
    try:
        from ._lib import library_path
        libdir = os.path.dirname(os.path.realpath(library_path))
        dirs += [os.path.join(libdir, "tools", exe), os.path.join(libdir, "..", "bin"),
                 os.path.join(libdir, "..", "..", "bin")]
    except ImportError:
        pass
    for d in dirs:
        p = os.path.join(d, exe)
        # A directory of the tool's name (a build tree's tools/ckpt-inspect/, when
        # LIBCKPT_TOOLS_DIR names tools/) is searchable, not runnable.
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.normpath(p)
    return shutil.which(exe)


def usage() -> str:
    lines = ["usage: python -m libckpt TOOL [ARGS...]", "",
             "Runs one of libckpt's command-line tools (each has --help):", ""]
    for name, (exe, what) in TOOLS.items():
        where = find_tool(exe) or "not found: set LIBCKPT_TOOLS_DIR or PATH"
        lines.append(f"  {name:<8} {exe:<13} {what}")
        lines.append(f"  {'':<8} {'':<13} ({where})")
    lines += ["", "  --version  the package's and the library's versions"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        import libckpt
        print(f"libckpt {libckpt.__version__} (library {libckpt.library_version}, "
              f"{libckpt.library_path})")
        return 0
    name = argv[0][5:] if argv[0].startswith("ckpt-") else argv[0]
    if name not in TOOLS:
        print(f"libckpt: no tool {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    exe = TOOLS[name][0]
    path = find_tool(exe)
    if path is None:
        print(f"libckpt: {exe} not found (set LIBCKPT_TOOLS_DIR, or put it on PATH)",
              file=sys.stderr)
        return 127
    os.execv(path, [exe] + argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
