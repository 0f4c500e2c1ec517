[ -d /work/backups ] || { echo "no directory /work/backups"; exit 1; }
[ -f /work/notes.txt ] || { echo "notes.txt is gone"; exit 1; }
echo "ok: backups/ exists"
