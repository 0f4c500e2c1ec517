cd /work
[ -f app.conf ] || { echo "app.conf is gone"; exit 1; }
[ -f app.conf.bak ] || { echo "no app.conf.bak"; exit 1; }
cmp -s app.conf app.conf.bak || { echo "app.conf.bak differs from app.conf"; exit 1; }
grep -q 'port = 8080' app.conf || { echo "app.conf was changed"; exit 1; }
echo "ok"
