package server

import "errors"

func isQueueFull(err error) bool {
	return errors.Is(err, ErrQueueFull)
}
