today=$(date +%F)
[ -f "/work/reports/$today.txt" ] || { echo "no reports/$today.txt (today is $today): $(ls /work/reports | tr '\n' ' ')"; exit 1; }
echo "ok: reports/$today.txt"
