printf 'port = 8080\nworkers = 4\nlog_level = info\n' > app.conf
