# thp.sh — sourced by the bench scripts: run fio with transparent huge pages on.
#
# fio's buffers come from malloc: with THP in "madvise" mode they are small pages,
# and a direct read or write of 1 MiB or more is then split by the block layer at
# its max_segments (often 254 x 4 KiB), an artefact libckpt's pool avoids by asking
# for huge pages (io_map_buffers). So that the raw limit is the device's, fio runs
# with THP "always" while this script may set it, restored after each run and on
# exit. thp_note says which for the table.
thp=/sys/kernel/mm/transparent_hugepage/enabled thp_was=
if [ -w "$thp" ]; then
  thp_was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp")
fi
thp_on()  { [ -z "$thp_was" ] || echo always > "$thp"; }
thp_off() { [ -z "$thp_was" ] || echo "$thp_was" > "$thp"; }
thp_note() { [ -n "$thp_was" ] && echo "THP on for fio" || echo "THP as the system has it"; }
