cd /work
if kill -0 4242 2>/dev/null; then want=running; else want=stale; fi
got=$(cat run/status.txt 2>/dev/null | tr -d '[:space:]')
[ "$got" = "$want" ] || { echo "run/status.txt says '$got', expected '$want'"; exit 1; }
if [ "$want" = stale ] && [ -e run/app.pid ]; then echo "stale run/app.pid not deleted"; exit 1; fi
echo "ok: $want"
