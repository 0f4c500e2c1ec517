mkdir run
echo 4242 > run/app.pid
touch run/app.lock
