#!/usr/bin/env bash
# test_abi_symbols.sh — the ABI kept by machine: the functions libckpt.so exports,
# the names cmake/libckpt.map lists, and the functions the public headers declare
# CKPT_API (every include/ckpt/*.h) must be the same three sets. A name in one and
# not in another fails, and the names are listed. Every exported symbol must also
# carry the node of the version script that lists it (LIBCKPT_x.y), and the script
# must list names, not patterns, in its global sections.
# Usage: test_abi_symbols.sh LIBCKPT_SO VERSION_SCRIPT INCLUDE_DIR
set -euo pipefail
lib=$1 map=$2 inc=$3
here=$(cd "$(dirname "$0")" && pwd)
for t in nm perl comm; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not found (binutils, perl)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# name@NODE for every defined dynamic symbol but the node names themselves
# (nm -D lists them as absolute symbols).
nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sort -u > "$tmp/exported.ver"
sed 's/@.*//' "$tmp/exported.ver" | sort -u > "$tmp/exported"

# name@NODE for every name in a global section of the version script.
perl -e '
	local $/; my $t = <STDIN>;
	$t =~ s{/\*.*?\*/}{ }gs; $t =~ s{#[^\n]*}{}g;
	my $bad = 0;
	while ($t =~ /([A-Za-z_][A-Za-z0-9_.]*)\s*\{(.*?)\}\s*([A-Za-z_][A-Za-z0-9_.]*)?\s*;/gs) {
		my ($node, $body) = ($1, $2);
		my $global = $body =~ /global:(.*?)(?:local:|$)/s ? $1 : "";
		for my $n (split /;/, $global) {
			$n =~ s/^\s+|\s+$//g;
			next if $n eq "";
			if ($n !~ /^[A-Za-z_][A-Za-z0-9_]*$/) {
				print STDERR "version script: node $node lists \"$n\", not a name\n";
				$bad = 1;
				next;
			}
			print "$n\@\@$node\n";
		}
	}
	exit $bad;' < "$map" | sort -u > "$tmp/script.ver" || fail=1
sed 's/@.*//' "$tmp/script.ver" | sort -u > "$tmp/script"

perl "$here/api_names.pl" "$inc"/ckpt/*.h > "$tmp/headers"

echo "exported by $(basename "$lib"): $(wc -l < "$tmp/exported")," \
     "in the version script: $(wc -l < "$tmp/script")," \
     "declared CKPT_API in $inc/ckpt: $(wc -l < "$tmp/headers")"
for f in exported script headers; do
  [ -s "$tmp/$f" ] || { echo "FAIL: no names found ($f): the test cannot compare"; fail=1; }
done

# only_in A B WHAT: the names of A that B lacks, listed.
only_in() {
  local d
  d=$(comm -23 "$tmp/$1" "$tmp/$2")
  if [ -n "$d" ]; then
    echo "FAIL: $3:"
    sed 's/^/    /' <<<"$d"
    fail=1
  fi
}
only_in exported headers "exported by the library but declared CKPT_API in no header"
only_in headers exported "declared CKPT_API but not exported by the library"
only_in script headers "in the version script but declared CKPT_API in no header"
only_in headers script "declared CKPT_API but missing from the version script"
only_in exported script "exported by the library but not in the version script"
only_in script exported "in the version script but not exported by the library"
# Same names, but each under the node the script puts it in.
only_in exported.ver script.ver "exported under another version node than the script's"

[ $fail -eq 0 ] && echo "OK: $(wc -l < "$tmp/exported") symbols agree"
exit $fail
