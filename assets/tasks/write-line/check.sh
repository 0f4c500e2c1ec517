[ -f /work/greeting.txt ] || { echo "no file greeting.txt"; exit 1; }
got=$(cat /work/greeting.txt)
[ "$got" = "hello world" ] || { echo "greeting.txt holds '$got', not 'hello world'"; exit 1; }
echo "ok"
