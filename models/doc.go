// Package models holds the models trained with Pagoda itself and shipped
// in the repository (see README.md); its tests check their quality.
package models
