cd /work
left=$(ls -A | grep '\.tmp$')
[ -z "$left" ] || { echo "still there: $left"; exit 1; }
for f in report.txt data.csv notes.tmp.txt; do
  [ -f "$f" ] || { echo "$f was deleted but does not end in .tmp"; exit 1; }
done
echo "ok"
