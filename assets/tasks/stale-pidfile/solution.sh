if kill -0 "$(cat run/app.pid)" 2>/dev/null; then
  echo running > run/status.txt
else
  rm run/app.pid
  echo stale > run/status.txt
fi
