cd /work
[ ! -e draft.txt ] || { echo "draft.txt still exists"; exit 1; }
[ "$(cat final.txt 2>/dev/null)" = "The quarterly report, version 3." ] || { echo "final.txt missing or not the draft's text"; exit 1; }
echo "ok"
