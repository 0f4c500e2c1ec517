cp app.conf app.conf.bak
