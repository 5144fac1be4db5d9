module dlock.dev/dlock

go 1.19
