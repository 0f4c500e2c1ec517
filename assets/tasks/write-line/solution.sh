echo "hello world" > greeting.txt
