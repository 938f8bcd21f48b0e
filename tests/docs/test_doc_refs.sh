#!/bin/bash
# test_doc_refs.sh SRCDIR — the repository's docs and comments cite only the
# repository's own documents: every docs/<name>.md named anywhere in the tree
# exists, and nothing cites a design, style or testing note kept outside it
# (DESIGN, STYLE, TESTING), a folder beside or above the repository, or a
# machine's own work directory, and no file names a work item by its number.
# Recorded outputs under bench/results/ are logs, not citations, and are left out.
# The patterns below bracket a letter ([s]hared) so that this file, checked too,
# does not match itself.
set -u
src=${1:?usage: test_doc_refs.sh SRCDIR}
cd "$src" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	mapfile -t files < <(git ls-files --cached --others --exclude-standard)
else
	mapfile -t files < <(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
fi
checked=()
for f in "${files[@]}"; do
	case $f in
	bench/results/*|tests/fuzz/corpus/*) continue ;;
	esac
	[ -f "$f" ] || continue
	grep -Iq . "$f" 2>/dev/null || continue          # text files only
	checked+=("$f")
done
[ ${#checked[@]} -gt 10 ] || { echo "only ${#checked[@]} files found under $src"; exit 1; }
fail=0
# A docs/*.md that is cited must exist.
while IFS= read -r hit; do
	file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; doc=${rest#*:}
	if [ ! -f "$doc" ]; then
		echo "$file:$line: cites $doc, which is not in the repository"
		fail=1
	fi
done < <(grep -noE 'docs/[A-Za-z0-9_.-]+\.md' "${checked[@]}" /dev/null)
# Notes kept outside the repository, and paths outside it.
outside='DESIGN(\.md| *§| rule)|STYLE(\.md| *§| rule| [0-9])|TESTING(\.md| *§)|\.\./[s]hared|(^|[^A-Za-z0-9_-])[s]hared/[A-Za-z]|/[w]ork/'
while IFS= read -r hit; do
	echo "$hit"
	echo "  ^ cites something outside the repository: name the repository's own document"
	fail=1
done < <(grep -nE "$outside" "${checked[@]}" /dev/null)
# Work items by number: what they asked for is said in the docs themselves.
while IFS= read -r hit; do
	echo "$hit"
	echo "  ^ cites a work item by number: say what it is instead"
	fail=1
done < <(grep -niE '(^|[^a-z_])issue[- ]?#?[0-9]+([^0-9,]|$)' "${checked[@]}" /dev/null)
echo "checked ${#checked[@]} files"
exit $fail
