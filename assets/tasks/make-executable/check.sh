[ -x /work/deploy.sh ] || { echo "deploy.sh is not executable: $(ls -l /work/deploy.sh 2>&1)"; exit 1; }
[ "$(/work/deploy.sh)" = "deploying" ] || { echo "deploy.sh was changed"; exit 1; }
echo "ok"
