got=$(tr -d '[:space:]' < /work/count.txt 2>/dev/null)
[ "$got" = "137" ] || { echo "count.txt holds '$got', data.csv has 137 lines"; exit 1; }
echo "ok"
