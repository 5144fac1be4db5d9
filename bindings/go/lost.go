package dlock

/*
#include <dlock.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// goDlockLost is the on_lost callback of every kept lock, called once from
// a keeper thread of libdlock with the cgo.Handle of the lock's state as
// its user pointer. It only records the loss and closes Lost()'s channel:
// libdlock asks for a callback that returns quickly and calls nothing that
// waits.
//
//export goDlockLost
func goDlockLost(lock *C.dlock_lock, code C.int, user unsafe.Pointer) {
	s := cgo.Handle(uintptr(user)).Value().(*lockState)
	s.markLost(Errno(code), C.GoString(C.dlock_lock_lost_detail(lock)))
}
